"""The reliability campaign (`make soak`): faults on a schedule, a history, a checker."""
