"""The trainer that torchrun starts on every rank (through launch_node/worker.py).

It imports nothing from `launcher/` so that a node needs only torch (plus numpy for PowerSGD,
scikit-learn for the digits set and Pillow for image folders); from launch's node runtime it
takes the files launch reads while it runs (launch_node/heartbeat.py, checkpoint_files.py).
"""
