"""The extension's versioned SQL scripts, shipped as package data (storetopics.install reads them)."""
