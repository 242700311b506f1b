# Sourced by ./up (and ./down) when SLURMDDP_LAB_SLURM=24.11: the same lab on Slurm 24.11 from a
# Debian trixie root built with mmdebstrap. Not a script of its own.
#
# How it works: the root (SLURMDDP_LAB_ROOT, default /var/cache/slurmddp-lab/trixie-root) is built
# once per machine and kept. Two directories of wrappers are put first on up's PATH, so the rest of
# up runs unchanged:
#   $LAB/sbin: the daemons and admin tools (munged, mungekey, slurmdbd, slurmctld, slurmd), each run
#              through ./in_root: chroot into the root, in a
#              private mount namespace where the project, the lab state, the Python interpreter,
#              $HOME, /tmp, /dev, /proc, /sys are bind-mounted at their own paths (jobs run there).
#   $LAB/bin:  the Slurm client commands, run on the machine itself through the root's dynamic
#              loader (--library-path), so working directory and environment are kept. Their
#              plugins come from PluginDir=$ROOT/usr/lib/.../slurm-wlm (written into slurm.conf);
#              inside the root, $ROOT is a symlink to / so the same PluginDir and the same wrappers
#              work for the daemons and for jobs too.
# MariaDB is not in the root: the lab runs the machine's own (Debian 12's 10.11, which the 22.05
# lab uses too), so the root does not depend on the MariaDB point release trixie ships. Trixie's
# 11.8.9 server made slurmdbd 24.11.5 die at start (`select @var := concat('')` answered with
# "5027 Number of columns in result (=1) set execeeds maxmimum allowed number of columns (=0)",
# over TCP and over the socket alike), while the same slurmdbd and client library work against
# 10.11.
# Everything else (namespaces, bridge, ports, state directory) gets its own name, so a 22.05 lab
# and a 24.11 lab can run at the same time.
# shellcheck shell=bash

case $SLURMDDP_LAB_SLURM in
  24.11) ;;
  *)
    printf 'slurm_lab: SLURMDDP_LAB_SLURM=%s: only 22.05 (the default) and 24.11 are known\n' "$SLURMDDP_LAB_SLURM" >&2
    exit 2
    ;;
esac

# NB: up's lost_daemons() takes every lab daemon whose command line or environment *contains*
# "$LAB/" as its own: no state directory may lie inside another lab's.
LAB=${SLURMDDP_LAB_DIR:-$SCRIPT_DIR/.slurm-24.11$SFX}
SUBNET=${SLURMDDP_LAB_SUBNET:-10.201.$INSTANCE}
NS_PREFIX=slurmddp24$SFX-    # slurmddp24-node1 ... (the hostnames inside stay node1 ...)
BRIDGE=slurmddp1$SFX
VETH_PREFIX=slurmddp24$SFX-n # IFNAMSIZ is 16: slurmddp24-9-n1 is 15
CTLD_PORT=$((PORT_BASE + 27))
SLURMD_PORT=$((PORT_BASE + 28))
DBD_PORT=$((PORT_BASE + 29))
# The machine's MariaDB server (see above); everything else comes from the root.
PACKAGES=(mariadb-server)
# runc is the root's (TRIXIE_PACKAGES), not the machine's.
LAB_BINARIES=(slurmctld slurmd sinfo sacct munged slurmdbd mariadbd mariadb-install-db)
ROOT=${SLURMDDP_LAB_ROOT:-/var/cache/slurmddp-lab/trixie-root}
export SLURMDDP_LAB_ROOT=$ROOT
# The Slurm release this lab is for: a root whose slurmctld says otherwise (the mirror moved on) is
# refused with that cause rather than run as if it were 24.11.
SLURM_SERIES=24.11
TRIXIE_PACKAGES=(slurmctld slurmd slurm-client munge slurmdbd
  # what a Python built on Debian 12 (pyenv, venv) loads besides libc, so it runs inside the root
  libffi8 libbz2-1.0 liblzma5 zlib1g libssl3t64 libsqlite3-0 libreadline8t64 libncursesw6 libuuid1
  libcrypt1 libexpat1
  # what jobs call besides Python (provenance records `git`; ps for debugging)
  git procps
  # the OCI runtime slurmstepd runs for srun --container (oci.conf)
  runc)
# mmdebstrap options besides the packages: no docs, man pages or translations.
TRIXIE_OPTS=(--dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*'
  --dpkgopt='path-exclude=/usr/share/locale/*')
# What the root was built from, kept in ROOT/.slurmddp-lab-complete: a change rebuilds it.
TRIXIE_RECIPE="${TRIXIE_PACKAGES[*]} ${TRIXIE_OPTS[*]}"
SLURM_LIBDIR=/usr/lib/x86_64-linux-gnu/slurm-wlm
EXPORT_EXTRA=" PATH=$LAB/bin:\$PATH"

trixie_say() { printf 'slurm_lab: %s\n' "$*" >&2; }

trixie_mirror() {  # the machine's own Debian mirror, from its apt sources (SLURMDDP_LAB_MIRROR wins)
  if [[ -n ${SLURMDDP_LAB_MIRROR:-} ]]; then
    printf '%s\n' "$SLURMDDP_LAB_MIRROR"
    return 0
  fi
  local f
  # deb822 stanzas: the first "Types: deb" one whose suites hold a plain release (not -security).
  for f in /etc/apt/sources.list.d/*.sources; do
    [[ -r $f ]] || continue
    awk '
      function flush() { if (deb && uri != "" && plain) { print uri; found = 1; exit } deb = 0; uri = ""; plain = 0 }
      /^[[:space:]]*$/ { flush(); next }
      /^[[:space:]]*#/ { next }
      tolower($1) == "types:" { for (i = 2; i <= NF; i++) if ($i == "deb") deb = 1 }
      tolower($1) == "uris:" { uri = $2 }
      tolower($1) == "suites:" { for (i = 2; i <= NF; i++) if ($i !~ /[-\/]/) plain = 1 }
      END { if (!found) flush() }' "$f" | head -n 1
  done | head -n 1 | grep . && return 0
  # one-line style: deb [options] URI suite components
  cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
    sed -E 's/\[[^]]*\]//' | awk '$1 == "deb" && $3 !~ /[-\/]/ { print $2; exit }' | grep .
}

trixie_root_ok() {
  [[ -x $ROOT/usr/sbin/slurmctld && -x $ROOT/usr/sbin/slurmdbd &&
    $(cat -- "$ROOT/.slurmddp-lab-complete" 2>/dev/null) == "$TRIXIE_RECIPE" ]]
}

trixie_check_release() {  # the root's Slurm is of SLURM_SERIES, or the lab stops here saying so
  local version
  version=$(chroot "$ROOT" /usr/sbin/slurmctld -V 2>&1) ||
    { trixie_say "error: the root's slurmctld does not run: $version (rebuild: rm -rf $ROOT)"; exit 1; }
  if [[ $version != "slurm-wlm $SLURM_SERIES."* && $version != "slurm $SLURM_SERIES."* ]]; then
    trixie_say "error: the root $ROOT holds $version, not Slurm $SLURM_SERIES: the mirror's trixie moved to another release; this lab and docs/slurm-versions.md are written for $SLURM_SERIES"
    exit 1
  fi
}

trixie_users() {  # PIDs running inside the root (the daemons and jobs of any 24.11 lab instance)
  local f
  [[ -d $ROOT ]] || return 0
  for f in /proc/[0-9]*/root; do
    [[ $(readlink -- "$f" 2>/dev/null) == "$ROOT" ]] && { f=${f#/proc/}; printf '%s ' "${f%/root}"; }
  done
  return 0
}

trixie_build_root() {
  local mirror tmp t0=$SECONDS
  mkdir -p -- "$(dirname -- "$ROOT")"
  exec 8>>"$ROOT.lock"
  flock -w 900 8 || { trixie_say "another build holds $ROOT.lock"; exit 1; }
  if ! trixie_root_ok; then
    if ! command -v mmdebstrap >/dev/null; then
      if [[ -n ${SLURMDDP_LAB_NO_INSTALL:-} ]] || ! command -v apt-get >/dev/null; then
        trixie_say "cannot run here: mmdebstrap is not installed"
        exit 77
      fi
      trixie_say "installing mmdebstrap"
      lab_apt_get install -y -q --no-install-recommends mmdebstrap >&2 ||
        { lab_apt_get update -q >&2 && lab_apt_get install -y -q --no-install-recommends mmdebstrap >&2; } ||
        { trixie_say "cannot run here: apt-get install mmdebstrap failed"; exit 77; }
    fi
    local users
    users=$(trixie_users)
    if [[ -n $users ]]; then
      trixie_say "the root $ROOT must be rebuilt (package list or options changed), but processes run inside it (a 24.11 lab: pids $users): stop it first (SLURMDDP_LAB_SLURM=24.11 $SCRIPT_DIR/down)"
      exit 1
    fi
    mirror=$(trixie_mirror) || { trixie_say "cannot run here: no Debian mirror found in the apt sources (set SLURMDDP_LAB_MIRROR)"; exit 77; }
    tmp=$ROOT.tmp.$$
    rm -rf -- "$tmp" "$ROOT"
    trixie_say "building the Debian trixie root $ROOT from $mirror (30 s to 2 min, ~230 MB)"
    local IFS=,
    if ! mmdebstrap --variant=apt --include="${TRIXIE_PACKAGES[*]}" "${TRIXIE_OPTS[@]}" trixie "$tmp" \
      "deb $mirror trixie main" >&2; then
      rm -rf -- "$tmp"
      trixie_say "cannot run here: mmdebstrap failed"
      exit 77
    fi
    unset IFS
    printf '%s\n' "$TRIXIE_RECIPE" >"$tmp/.slurmddp-lab-complete"
    mv -- "$tmp" "$ROOT"
    trixie_say "root built in $((SECONDS - t0))s: $(chroot "$ROOT" /usr/sbin/slurmctld -V)"
  fi
  # Inside the root, $ROOT leads back to / (PluginDir and the client wrappers name $ROOT paths).
  if [[ ! -L $ROOT$ROOT ]]; then
    mkdir -p -- "$(dirname -- "$ROOT$ROOT")"
    ln -sfn / "$ROOT$ROOT"
  fi
  [[ -e $ROOT/etc/hosts ]] || : >"$ROOT/etc/hosts"   # a bind-mount target
  # Debian's /usr/sbin/slurmctld, slurmd and slurmstepd are alternatives symlinks to *-wlm. Since
  # 23.11 `scontrol reconfigure` makes slurmctld and slurmd re-exec themselves by their resolved
  # path: the new processes would be called slurmctld-wlm / slurmd-wlm, which up's PID-file checks
  # (and `down`) do not recognise. A hard link keeps the names.
  local b
  for b in slurmctld slurmd slurmstepd; do
    if [[ -L $ROOT/usr/sbin/$b && -f $ROOT/usr/sbin/$b-wlm ]]; then
      ln -f -- "$ROOT/usr/sbin/$b-wlm" "$ROOT/usr/sbin/$b"
    fi
  done
  exec 8>&-
}

trixie_binds() {  # the machine's directories jobs need inside the root, colon-separated
  local d x py out=() seen
  py=$(python3 -c 'import sys; print(sys.prefix); print(sys.base_prefix)' 2>/dev/null) || py=
  for d in "$(cd -- "$SCRIPT_DIR/../.." && pwd -P)" "$LAB" ${HOME:+"$HOME"} $py \
    ${SLURMDDP_LAB_BINDS:+$(tr ':' ' ' <<<"$SLURMDDP_LAB_BINDS")}; do
    [[ -d $d ]] || continue
    d=$(cd -- "$d" && pwd -P)
    case $d/ in
      /usr/local/*) ;;
      / | /usr/* | /etc/* | /bin/* | /sbin/* | /lib/* | /lib64/* | /var/* | /run/* | /proc/* | /sys/* | /dev/*)
        trixie_say "warning: $d is part of the machine's system and is not visible inside the 24.11 root (jobs cannot use it)"
        continue
        ;;
    esac
    seen=
    for x in "${out[@]}"; do [[ $d == "$x" ]] && seen=1; done
    [[ -n $seen ]] || out+=("$d")
  done
  local IFS=:
  printf '%s\n' "${out[*]}"
}

trixie_put() {  # file content: replace only when it changes, atomically (jobs may be running it)
  local tmp=$1.tmp.$$
  printf '%s\n' "$2" >"$tmp" && chmod 755 "$tmp"
  if cmp -s -- "$tmp" "$1"; then rm -f -- "$tmp"; else mv -f -- "$tmp" "$1"; fi
}

trixie_wrappers() {
  local b name in_root=$SCRIPT_DIR/in_root
  local ld=$ROOT/lib64/ld-linux-x86-64.so.2
  local libs=$ROOT$SLURM_LIBDIR:$ROOT/usr/lib/x86_64-linux-gnu:$ROOT/lib/x86_64-linux-gnu
  mkdir -p -- "$LAB/bin" "$LAB/sbin"
  for b in sacct sacctmgr salloc sattach sbatch sbcast scancel scontrol scrontab sdiag sinfo sprio \
    squeue sreport srun sshare sstat strigger; do
    trixie_put "$LAB/bin/$b" "#!/bin/sh
exec $ld --library-path $libs --argv0 $b $ROOT/usr/bin/$b \"\$@\""
  done
  local daemons=(munged mungekey slurmdbd slurmctld slurmd)
  for name in "${daemons[@]}"; do
    trixie_put "$LAB/sbin/$name" "#!/bin/sh
SLURMDDP_LAB_ROOT=$ROOT SLURMDDP_LAB_BINDS=$TRIXIE_BINDS exec $in_root $name \"\$@\""
  done
  # A wrapper an older recipe made (mariadbd, when the root held MariaDB) would hide the machine's.
  for b in "$LAB"/sbin/*; do
    [[ " ${daemons[*]} " == *" ${b##*/} "* ]] || rm -f -- "$b"
  done
}

# slurm.conf as 22.05 wants it, adapted (called by up right after it writes the configs).
lab_adapt_conf() {
  printf '# 24.11 lab: client commands run from the machine load their plugins from the root.\nPluginDir=%s\n' \
    "$ROOT$SLURM_LIBDIR" >>"$CONF"
  if [[ -z ${SLURMDDP_LAB_22_SPELLING:-} ]]; then
    # 23.02+: "preempt_send_user_signal" moved from SlurmctldParameters to PreemptParameters.
    sed -i 's/^SlurmctldParameters=preempt_send_user_signal$/PreemptParameters=send_user_signal/' "$CONF"
  fi
}

if [[ ${1:-} != --down && $EUID -eq 0 ]]; then
  trixie_build_root
  trixie_check_release
  TRIXIE_BINDS=$(trixie_binds)
  trixie_wrappers
fi
export PATH="$LAB/bin:$LAB/sbin:$PATH"
