#!/usr/bin/env bash
# The fault suite as a table: runs every Faults.* case of the integration tests (each makes its
# fault for real: damaged checkpoints, a used or locked run folder, a full tmpfs, a taken port, a
# signal during start-up) and prints case, expected behaviour and the result (ok, FAILED, or
# skipped with the reason, e.g. when a tmpfs cannot be mounted). Build xlme_integration_tests first.
#   scripts/fault_check.sh [GTEST_FILTER]     (default: Faults.*)
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${XLME_BUILD_DIR:-$root/build}
filter=${1:-Faults.*}
log=$(mktemp)
trap 'rm -f "$log"' EXIT

declare -A expected=(
  [DamagedNewestCheckpointNeverCostsTheNewOne]="new checkpoint kept, damaged one untouched"
  [FreshStartInAUsedFolderIsRefusedAndOverwriteKeepsTheOldRunAside]="refused naming --overwrite; old run kept aside"
  [PruningCountsAndRemovesOnlyTheRunsOwnCheckpoints]="keep_last of its own; stray/empty/other kept"
  [FailedSaveRemovesItsTemporaryFolder]="error; earlier checkpoint intact, no .tmp"
  [ExportForceReplacesOnlyAnExportFolder]="exit 1 with the reason; nothing deleted"
  [SecondRunInTheSameFolderFailsNamingTheHolder]="exit 1 naming pid and host"
  [TheRunFolderLockEndsWithTheRun]="next run proceeds"
  [DiskFullWritingTheModelIsAnErrorAndKeepsThePreviousCheckpoint]="exit 1 'no space left ... model.pt'"
  [DamagedManifestIsNamedAndSkippedByResumeAuto]="skipped by auto; file+field named elsewhere"
  [ResumeFromAMissingPathSaysItDoesNotExist]="error 'does not exist'"
  [ResumeWithAnotherModelShapeNamesTheField]="error naming model.ffn_size"
  [ConfigFolderAndEmptyOutDirAreNamed]="exit 1 'is a folder' / 'is empty'"
  [StopSignalDuringStartUpSavesAndExits75]="exit 75, checkpoint of step 0"
  [MetricsAreNotDuplicatedAfterAResume]="each step logged once"
  [RanksWithDifferentRunFoldersFailAtStart]="exit 1 on every rank naming run.out_dir"
  [TakenMasterPortIsNamed]="error 'MASTER_PORT N is already taken'"
  [RankZeroNamesTheMissingRankWhileWaiting]="warning every 30 s naming ranks 1, 2"
)

"$build_dir/tests/xlme_integration_tests" --gtest_filter="$filter" >"$log" 2>&1
status=$?
printf '%-64s | %-48s | %s\n' case expected got
printf '%-64s-+-%-48s-+-%s\n' "$(printf -- '-%.0s' {1..64})" "$(printf -- '-%.0s' {1..48})" '------'
grep -E '^\[ +(OK|FAILED|SKIPPED) +\] Faults\.[A-Za-z0-9_]+ \(' "$log" | while read -r line; do
  name=$(sed -E 's/.*Faults\.([A-Za-z0-9_]+).*/\1/' <<<"$line")
  case "$line" in
    *"[       OK ]"*) got=ok ;;
    *SKIPPED*) got="skipped: $(grep -A3 "RUN .*Faults.$name\$" "$log" | sed -n 3p)" ;;
    *) got=FAILED ;;
  esac
  printf '%-64s | %-48s | %s\n' "$name" "${expected[$name]:-?}" "$got"
done
exit $status
