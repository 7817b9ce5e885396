# Stage timing shared by the test scripts (sourced): `stage NAME` ends the stage under way and
# starts NAME (`stage ""` ends the last); `stage_times TITLE` prints each stage's wall-clock time.
# STAGE_LABEL, when set, prefixes each stage's banner ("podman: ").
STAGES=()
stage_name=""
stage_start=$SECONDS
stage() {
  if [ -n "$stage_name" ]; then
    STAGES+=("$(printf '%5d s  %s' $((SECONDS - stage_start)) "$stage_name")")
  fi
  stage_name=$1
  stage_start=$SECONDS
  [ -z "$stage_name" ] || echo "== ${STAGE_LABEL:-}$stage_name" >&2
}
stage_times() {
  stage ""
  if [ ${#STAGES[@]} -gt 0 ]; then
    echo "== $1" >&2
    printf '%s\n' "${STAGES[@]}" >&2
  fi
}
