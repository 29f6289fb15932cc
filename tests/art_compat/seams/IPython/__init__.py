"""Stand-in for IPython when it is not installed: what a notebook's cells reach of Jupyter's display
(`IPython.display`), recording what they show instead of rendering it."""
