"""Plans: a plan's rules, the minimax plan on known curves (bounds, repair), proposals and the schedule."""
