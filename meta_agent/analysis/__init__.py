"""What a batch of episodes shows: rollout and role metrics, reflection metrics and plan adherence, statistics, the HTML report."""
