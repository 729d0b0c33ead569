"""``chordbeat web``: the operators' dashboard, server-rendered pages over the database and Redis."""
