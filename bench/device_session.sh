#!/usr/bin/env bash
# Several parts of device_round.sh in one device call, their results brought back within the
# device's limit on returned files (8): each part's folder packed into $OUT/PART.tar.gz, what
# they printed in $OUT/session.log.
#   bench/device_session.sh PART[:VAR=VALUE,VAR=VALUE...] ...
# e.g. bench/device_session.sh standby "zygote:LEARN_ONLY=1,SWEEPS=list list-again" \
#        sharing:REPS=3,WARM=0,EXIT_PROBE=0 boundary:ROUNDS=1
set -uo pipefail
: "${OUT:?}"
work=$(mktemp -d)
start=$(date +%s)
for spec in "$@"; do
  part=${spec%%:*}; vars=""; [ "$spec" != "$part" ] && vars=${spec#*:}
  echo "== $part ($vars) at $(( $(date +%s) - start )) s"
  (
    if [ -n "$vars" ]; then IFS=,; for kv in $vars; do export "$kv"; done; unset IFS; fi
    OUT=$work bash bench/device_round.sh "$part"
  )
  tar czf "$OUT/$part.tar.gz" -C "$work" "$part" 2> /dev/null
done 2>&1 | tee "$OUT/session.log"
echo "== done at $(( $(date +%s) - start )) s" | tee -a "$OUT/session.log"
