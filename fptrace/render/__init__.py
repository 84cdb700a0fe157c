"""Renderers: build rich renderables from result objects. They never print and never touch
torch; the CLI hands what they build to a Console."""
