from storetopics import install as st_install

VERSION = st_install.default_version()


def test_extension_installed(conn):
    assert conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'storetopics'").fetchone()[0] == VERSION

