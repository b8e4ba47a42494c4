#!/bin/bash
expected=$(cat /app/data/*.txt | wc -l)
if [ "$(ls /app/data/*.txt | wc -l)" = "$EXPECTED_FILES" ] && [ "$(tr -d ' \n' < /app/total.txt 2>/dev/null)" = "$expected" ]; then
    echo 1 > /logs/verifier/reward.txt
else
    echo 0 > /logs/verifier/reward.txt
fi
