"""What a user sees of a run: report.md/json, the HTML page and its plots, compare, the terminal's live view."""
