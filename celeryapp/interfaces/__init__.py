"""How people and services reach chordbeat: the service tasks, read models, CLI, dashboard."""
