"""PySpark adapters: session building, parallel snapshot tasks, silver batch preparation."""
