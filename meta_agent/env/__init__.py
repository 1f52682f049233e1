"""The episode behind PettingZoo: the AEC and parallel environments, and train.env's adaptor that plays any PettingZoo env as episodes."""
