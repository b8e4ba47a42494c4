#!/bin/bash
cat "$DATA_DIR"/*.txt | wc -l > /app/total.txt
