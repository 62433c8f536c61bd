"""storetopics: a short, machine-maintained summary of what each pgvector data store holds, kept in Postgres."""
__version__ = "0.2.0"
