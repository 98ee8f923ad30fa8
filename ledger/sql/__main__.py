"""``python -m ledger.sql <function> <version>``: the SHA-256 a migration loading that version names."""

import sys

from ledger.sql.versions import digest, sql_of

if __name__ == "__main__":
    print(digest(sql_of(sys.argv[1], int(sys.argv[2]))))
