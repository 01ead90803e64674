#!/usr/bin/env bash
# What the hook costs a program before it loads anything (issue 27 item 5,
# run 54's notes: "from the interpreter's start to the model loaded: stock
# 13.53 s, hooked 16.71 s" while the call itself took 3.63 against 1.30 s).
# Fresh processes, stock and PHXMOUNT_HOOK=1 taking turns, REPS each:
#   1. the interpreter's start to `import torch, transformers` and
#      `from transformers import AutoModelForCausalLM` done (a program's top);
#   2. the same, then the CUDA context (torch.empty on cuda:0);
# then one `python3 -X importtime` of (1) per side, its 25 slowest
# modules (cumulative), and the modules only the hooked side imported.
# No mount is needed: the hook imports the same whatever the files are.
# It pip-installs ./python (the hook's .pth), as smallprof.sh does: run it
# on the GPU machine, not where the tests run (the .pth would stay).
#
#   bash scripts/gpu-probes/importprobe.sh    on the GPU machine (~40 s);
#                                             $OUT gets importprobe.txt
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT" || exit 1
OUT=${OUT:-.devcarry/out}
REPS=${REPS:-3}
T=$OUT/importprobe.txt
mkdir -p "$OUT"
: >"$T"
python3 -m pip install -q --no-index --no-deps --no-build-isolation ./python >/dev/null 2>&1 ||
	echo "pip install ./python failed: the hook's .pth is not installed" | tee -a "$T"
TOP='import time; t=time.time(); import torch, transformers; from transformers import AutoModelForCausalLM'
CTX='; a=time.time(); torch.empty(1, device="cuda:0"); torch.cuda.synchronize(); b=time.time()'
run() { # side, code: seconds from spawn to the code's end, as the parent sees it
	local s=$1 code=$2 t0 t1
	t0=$(date +%s.%N)
	if [ "$s" = hooked ]; then
		PHXMOUNT_HOOK=1 python3 -c "$code" || echo "(exit $?)"
	else
		env -u PHXMOUNT_HOOK python3 -c "$code" || echo "(exit $?)"
	fi
	t1=$(date +%s.%N)
	echo "$t0 $t1" | awk '{printf "%.3f", $2 - $1}'
}
for what in top top+context; do
	code=$TOP
	[ "$what" = top+context ] && code="$TOP$CTX; print(f'context {b-a:.3f} s', end=' ')"
	for i in $(seq "$REPS"); do
		for s in stock hooked; do
			echo "$what $s rep $i: $(run $s "$code") s (spawn to end)" | tee -a "$T"
		done
	done
done
for s in stock hooked; do
	f=$OUT/importtime-$s.txt
	if [ "$s" = hooked ]; then
		PHXMOUNT_HOOK=1 python3 -X importtime -c "$TOP" 2>"$f"
	else
		env -u PHXMOUNT_HOOK python3 -X importtime -c "$TOP" 2>"$f"
	fi
	echo "== $s: $(grep -c 'import time:' "$f") modules; the 25 slowest (cumulative us)" | tee -a "$T"
	grep 'import time:' "$f" | awk -F'|' '{gsub(/ /,"",$2); print $2, $3}' | sort -rn | head -25 | tee -a "$T"
done
echo "== imported by the hooked side only" | tee -a "$T"
mods() { grep 'import time:' "$1" | awk -F'|' '{gsub(/^ +| +$/,"",$3); print $3}' | sort; }
comm -13 <(mods "$OUT/importtime-stock.txt") <(mods "$OUT/importtime-hooked.txt") | head -60 | tee -a "$T"
