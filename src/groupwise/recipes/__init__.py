"""Ready-made jobs behind CLI commands: they compose envs, backends and `gw.fit`; nothing below imports them.

`recipes.train` is `groupwise train <env>` (the main job).
"""
