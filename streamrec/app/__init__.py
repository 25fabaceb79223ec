"""The application layer: the ``streamrec`` CLI, the demo, the run report and the
process supervisor. Nothing imports it; it may import every part below it."""
