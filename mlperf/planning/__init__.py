"""The cluster planner's library: candidate search and ranking (`search`) and the
analytic reports (`reports`); `launch.plan` is its command line."""
