#!/usr/bin/env python3
"""Gives one seeded key of a SQLite store more usage credits than any bench run spends
(generation 1, no refill), so that each of its requests also spends a credit.

usage: give_credits.py DB SECRET
"""
import hashlib
import sqlite3
import sys

db = sqlite3.connect(sys.argv[1])
hashed = hashlib.sha256(sys.argv[2].encode()).hexdigest()
changed = db.execute(
    "UPDATE api_keys SET credits_remaining = 4000000000000000, credits_generation = 1 "
    "WHERE key_hash = ?",
    (hashed,),
).rowcount
db.commit()
if changed != 1:
    sys.exit("give_credits.py: no such key in the store")
