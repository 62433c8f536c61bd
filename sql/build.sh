#!/bin/sh
# Builds a versioned script from the SQL sources, as `make sql` does (pgai's layout: migrations that run once,
# then the idempotent files that every install and upgrade runs again):
#   sql/build.sh install VERSION        the install script storetopics--VERSION.sql
#   sql/build.sh upgrade FROM VERSION   the upgrade script storetopics--FROM--VERSION.sql
# incremental/<version>/*.sql run once: an install runs those of every version up to VERSION, an upgrade those
# after FROM.  idempotent/*.sql (CREATE OR REPLACE, in file order) follow in both.
set -eu
cd "$(dirname "$0")"
case "${1:-}" in
  install) from=""; version=$2
           printf '%s\n' '\echo Use "CREATE EXTENSION storetopics CASCADE" to load this file, or `storetopics install --dsn DSN`. \quit' ;;
  upgrade) from=$2; version=$3
           printf '%s\n' '\echo Use "ALTER EXTENSION storetopics UPDATE" to load this file, or `storetopics install --dsn DSN`. \quit' ;;
  *) echo "usage: sql/build.sh install VERSION | upgrade FROM VERSION" >&2; exit 2 ;;
esac
echo "-- storetopics $version${from:+ (upgrade from $from)}: built by \`make sql\` from sql/incremental and sql/idempotent;"
echo "-- edit those, not this file."
for dir in $(ls -d incremental/*/ | sed 's:/$::' | sort -t/ -k2 -V); do
  v=${dir#incremental/}
  newer_than_from=yes
  if [ -n "$from" ] && [ "$(printf '%s\n%s\n' "$v" "$from" | sort -V | tail -n1)" = "$from" ]; then newer_than_from=no; fi
  up_to_version=yes
  if [ "$v" != "$version" ] && [ "$(printf '%s\n%s\n' "$v" "$version" | sort -V | tail -n1)" = "$v" ]; then up_to_version=no; fi
  if [ $newer_than_from = yes ] && [ $up_to_version = yes ]; then
    for f in $(ls "$dir"/*.sql | sort); do printf '\n-- %s\n' "$f"; cat "$f"; done
  fi
done
for f in $(ls idempotent/*.sql | sort); do printf '\n-- %s\n' "$f"; cat "$f"; done
printf "\nUPDATE storetopics.meta SET value = '%s' WHERE key = 'version';\n" "$version"
# The build: a digest of the idempotent sources.  Generated functions are stamped with it (storetopics._stamp), so a
# build that changed their templates makes them again at their next use, at the same version too.
build=$(cat idempotent/*.sql | cksum | cut -d' ' -f1)
printf "INSERT INTO storetopics.meta VALUES ('build', '%s') ON CONFLICT (key) DO UPDATE SET value = excluded.value;\n" "$build"
