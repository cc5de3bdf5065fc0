#!/usr/bin/env bash
# Build the zip to upload as a Gradescope autograder: setup.sh and run_autograder at the root (Gradescope requires
# them there), the suite at the committed HEAD under bert-acceptance/.   Usage: make_autograder_zip.sh [OUT.zip]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(git -C "$here" rev-parse --show-toplevel)"
out="$(realpath -m "${1:-autograder.zip}")"
git -C "$repo" archive --format=zip --prefix=bert-acceptance/ -o "$out" HEAD
python3 - "$out" "$here/setup.sh" "$here/run_autograder" <<'PY'
import sys, zipfile
out, *scripts = sys.argv[1:]
with zipfile.ZipFile(out, "a", zipfile.ZIP_DEFLATED) as zf:
    for path in scripts:
        info = zipfile.ZipInfo(path.rsplit("/", 1)[-1])
        info.external_attr = 0o100755 << 16          # executable, as Gradescope runs them
        info.compress_type = zipfile.ZIP_DEFLATED
        zf.writestr(info, open(path, "rb").read())
PY
echo "wrote $out: upload it as the assignment's autograder (Configure Autograder -> Zip file upload)"
