"""The episode: the protocol's state machine, its records and prompts, the chat format, the batched runner, reflection traces, the reward step."""
