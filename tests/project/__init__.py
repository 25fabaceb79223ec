"""The project as a whole: package layout and import layers, CLI, docs, deploy files."""
