"""Foundations every package may import: errors, command configs, files, devices, executors, progress."""
