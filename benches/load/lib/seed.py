#!/usr/bin/env python3
"""Seeds a migrated gateway store (a SQLite file, or a PostgreSQL database given
as a postgres:// URL, loaded with psql's COPY) with N API keys in the gateway's own
format (src/auth/token.rs: `mpg_` + 32 base62 + 6 base62 of CRC32 over the 32;
only the SHA-256 hex is stored, src/store/sql/keys.rs), far faster than N
`mpg-gateway keys create` calls. The organization and user must exist (the
suite creates them with the admin commands). Writes the secrets, one a line,
to KEYS_OUT, and 1 000 well-formed keys that are NOT stored to INVALID_OUT;
with IDS_OUT, also "SECRET KEY_ID" a line (for the peers' identity maps).

usage: seed.py DB|POSTGRES_URL ORG USER N KEYS_OUT INVALID_OUT [IDS_OUT]
"""
import hashlib
import subprocess
import secrets
import sqlite3
import sys
import time
import zlib

ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def base62(n: int) -> str:
    return "".join(secrets.choice(ALPHABET) for _ in range(n))


def checksum(body: str) -> str:
    value = zlib.crc32(body.encode())  # the IEEE CRC-32 crc32fast computes
    out = []
    for _ in range(6):
        out.append(ALPHABET[value % 62])
        value //= 62
    return "".join(reversed(out))


def new_key() -> str:
    body = base62(32)
    return "mpg_" + body + checksum(body)


def main() -> None:
    db, org, user, n, keys_out, invalid_out = sys.argv[1:7]
    ids_out = sys.argv[7] if len(sys.argv) > 7 else None
    n = int(n)
    now = int(time.time())
    rows, keys = [], []
    for i in range(n):
        key = new_key()
        keys.append(key)
        rows.append((
            "key_" + base62(16),
            hashlib.sha256(key.encode()).hexdigest(),
            key[4:12],
            f"bench-{i}",
            org,
            user,
            "clusters:read",
            now,
        ))
    columns = "id, key_hash, prefix, name, organization_id, user_id, scopes, created_at"
    if db.startswith(("postgres://", "postgresql://")):
        # No field holds a tab, a newline or a backslash: COPY's text format as is.
        data = "".join("\t".join(str(v) for v in row) + "\n" for row in rows)
        subprocess.run(["psql", "-q", "-v", "ON_ERROR_STOP=1", db, "-c",
                        f"\\copy api_keys ({columns}) FROM pstdin"],
                       input=data, text=True, check=True)
    else:
        conn = sqlite3.connect(db)
        conn.executemany(f"INSERT INTO api_keys ({columns}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
        conn.commit()
        conn.close()
    with open(keys_out, "w") as f:
        f.write("\n".join(keys) + "\n")
    if ids_out:
        with open(ids_out, "w") as f:
            f.write("".join(f"{k} {r[0]}\n" for k, r in zip(keys, rows)))
    with open(invalid_out, "w") as f:
        f.write("\n".join(new_key() for _ in range(1000)) + "\n")


if __name__ == "__main__":
    main()
