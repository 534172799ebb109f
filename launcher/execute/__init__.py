"""Executors carry out a RunPlan: locally (subprocess) or over SSH (fabric)."""
