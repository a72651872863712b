"""Replay traces on BlockManagers, measure, and report (see README.md, "How measurements are made")."""
