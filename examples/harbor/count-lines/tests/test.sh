#!/bin/bash
# The expected total is counted in the task's own copy of the data (tests/data, read-only at
# /tests): the agent may rewrite /app/data, so a count of it proves nothing (blank data files
# and `echo 0 > total.txt` once scored 1). -f: a FIFO would keep the read waiting.
expected=$(cat /tests/data/*.txt | wc -l)
answer=/app/total.txt
if [ "$(ls /app/data/*.txt | wc -l)" = "$EXPECTED_FILES" ] && [ -f "$answer" ] \
    && [ "$(head -c 64 "$answer" | tr -d ' \n')" = "$expected" ]; then
    echo 1 > /logs/verifier/reward.txt
else
    echo 0 > /logs/verifier/reward.txt
fi
