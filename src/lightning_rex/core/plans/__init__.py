"""Plans: their rules, the minimax plan on known curves, proposals and the schedule."""
