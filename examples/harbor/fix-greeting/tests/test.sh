#!/bin/bash
# Harbor's contract: write the reward (0 or 1 here) to /logs/verifier/reward.txt.
cd /app
if python3 /tests/test_greet.py; then
    echo 1 > /logs/verifier/reward.txt
else
    echo 0 > /logs/verifier/reward.txt
fi
