"""The bottom layer: errors, names, size limits, bounded file reading and writing, $LAUNCH_HOME, files launch ships, plain tables. Imports nothing else of launch's."""
