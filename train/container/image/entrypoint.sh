#!/bin/sh
# Container entry point (after tini): load the runtime environment files baked
# into the image, without overriding what docker run -e / compose set, then
# hand over to the trainbox CLI with the run directory
# $TRAINBOX_RUNS/$TRAINBOX_RUN_NAME:
#   demo [RUN ARGS]   python -m trainbox demo --run-dir RUN_DIR RUN ARGS: the demo
#                     dataset written into the run directory, trained (the image's default)
#   train RUN ARGS    python -m trainbox run --run-dir RUN_DIR RUN ARGS
#   health [--act]    python -m trainbox health --run-dir RUN_DIR (HEALTHCHECK: --act)
#   bash / sh         a shell with this environment (invoke shell)
#   anything else     python -m trainbox ARGS
set -eu
for file in /etc/trainbox/env.d/*.env; do
  while IFS='=' read -r key value; do
    case "$key" in ''|'#'*) continue ;; esac
    eval "isset=\${$key+x}"
    [ -n "$isset" ] || export "$key=$value"
  done <"$file"
done
run_dir="$TRAINBOX_RUNS/${TRAINBOX_RUN_NAME:-demo}"
# The run directory of every trainbox command here (run's --run-dir says the same; trainbox.exit_record uses this).
export TRAIN_RUN_DIR="$run_dir"
command="${1:-}"
[ $# -eq 0 ] || shift
case "$command" in
  demo) exec python -m trainbox demo --run-dir "$run_dir" "$@" ;;
  train) exec python -m trainbox run --run-dir "$run_dir" "$@" ;;
  health) exec python -m trainbox health --run-dir "$run_dir" "$@" ;;
  bash|sh) exec "$command" "$@" ;;
esac
[ -n "$command" ] || exec python -m trainbox --help
exec python -m trainbox "$command" "$@"
