"""The learning stages: the GRPO (or DPO) training loop, SFT, credit (advantages onto episodes), preference pairs."""
