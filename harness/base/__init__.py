"""The floor every measurement stands on: replays, drivers, clocks, statistics, the row schema."""
