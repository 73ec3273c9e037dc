"""Plans: a plan's rules, the planner (water-filling, bounds), proposals and the schedule."""
