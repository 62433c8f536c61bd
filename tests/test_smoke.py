def test_extension_installed(conn):
    assert conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'storetopics'").fetchone()[0] == "0.1"
