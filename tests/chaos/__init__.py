"""The chaos suite: a seeded fault schedule against a real local cluster while producers write,
then a checker that reads everything back (see CHAOS.md)."""
