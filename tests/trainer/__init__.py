"""The trainer: learning, FAE scheduling, checkpoints and resume, the process, snapshot publishing."""
