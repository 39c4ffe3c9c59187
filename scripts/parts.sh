#!/usr/bin/env bash
# The parts, checked (docs/DESIGN.md, "Parts that own their state"):
#  1. each part of the file system's and the heap's state keeps its fields to its owner:
#     private, or `pub(super)` where the owner is a folder (the map index is fs/map/);
#  2. no circle of imports among the files of any crate: a file reaches another for a name
#     only if that one does not, through any chain, reach back.
# An import is a `use` of, or a path through, `crate::`, `crate::fs::` or `super::`; a
# folder's mod.rs re-exporting its children (`pub use child::Name`) is its face, not an import.
# Prints the offending field or circle and exits 1; prints a one-line summary and exits 0.
set -euo pipefail
cd "$(dirname "$0")/.."
fail=0

# 1. Each part: its struct, the file that defines it, and whether the owner is its folder.
parts=(
  "Namespace crates/flashfs/src/fs/namespace.rs file"
  "WriteBack crates/flashfs/src/fs/write.rs file"
  "OpenPage crates/flashfs/src/fs/write.rs file"
  "Budget crates/flashfs/src/fs/budget.rs file"
  "Reservations crates/flashfs/src/fs/falloc.rs file"
  "CkptState crates/flashfs/src/fs/checkpoint.rs file"
  "PageCache crates/flashfs/src/fs/cache.rs file"
  "ReadCache crates/flashfs/src/fs/ops.rs file"
  "CleanerState crates/flashfs/src/fs/clean/mod.rs folder"
  "Index crates/flashfs/src/fs/map/index.rs folder"
  "Groups crates/flashfs/src/fs/map/groups.rs folder"
)
for p in "${parts[@]}"; do
  read -r name file owner <<<"$p"
  body=$(awk -v n="$name" '$0 ~ "struct " n " \\{" {on=1; next} on && /^\}/ {exit} on' "$file")
  if [ -z "$body" ]; then
    echo "parts: no struct $name in $file" >&2
    fail=1
    continue
  fi
  allowed='^[[:space:]]+[a-z_]+:'
  [ "$owner" = folder ] && allowed='^[[:space:]]+(pub\(super\) )?[a-z_]+:'
  if grep -E '^[[:space:]]+pub' <<<"$body" | grep -vE "$allowed" >&2; then
    echo "parts: $name ($file) shows the fields above beyond its $owner" >&2
    fail=1
  fi
done

# 2. Circles: the import graph of each tree, sorted; tsort names the files of any loop.
graph() { # root-dir path-prefix-of-root
  perl -e '
    use strict; use warnings;
    my ($root, $prefix) = @ARGV;
    my @files = grep { !m{/bin/} } split /\n/, `find $root -name "*.rs" | sort`;
    my %mod;  # module path ("a", "a/b", "" for the root) -> file
    for my $f (@files) {
      (my $m = substr($f, length($root) + 1)) =~ s/\.rs$//;
      $m =~ s{(^|/)(mod|lib|main)$}{};
      $mod{$m} = $f;
    }
    # What each face hands on: name -> the module that defines it.
    my %handed;
    for my $m (keys %mod) {
      open my $fh, "<", $mod{$m} or die; local $/; my $src = <$fh>;
      while ($src =~ /^\s*pub(?:\([a-z]+\))? use ((?:\w+::)+)(?:\{([^;]*)\}|(\w+));/mg) {
        my ($path, $names) = ($1, defined $2 ? $2 : $3);
        $path =~ s/::$//;
        my @seg = grep { $_ ne "crate" && $_ ne $prefix && $_ ne "self" } split /::/, $path;
        my $to = $path =~ /^crate::/ ? join("/", @seg) : join("/", grep { $_ ne "" } $m, @seg);
        next unless exists $mod{$to};
        $handed{$m}{$_} = $to for map { s/^\s+|\s+$//gr } split /,/, $names;
      }
    }
    for my $f (@files) {
      (my $m = substr($f, length($root) + 1)) =~ s/\.rs$//;
      my $is_face = $m =~ s{(^|/)(mod|lib|main)$}{};
      my $parent = $is_face ? $m : ($m =~ m{^(.*)/[^/]+$} ? $1 : "");
      my $up = $parent =~ m{^(.*)/[^/]+$} ? $1 : "";
      $up = "" if $parent eq "";
      open my $fh, "<", $f or die; local $/; my $src = <$fh>;
      $src =~ s{#\[cfg\(test\)\]\s*mod tests.*}{}s;     # a file'"'"'s tests are the file
      $src =~ s{^\s*pub(\([a-z]+\))? use [^;]*;}{}mg if $is_face;
      $src =~ s{//[^\n]*}{}g;
      my @paths;
      # Expand `use a::{b, c::{d, e}}` into a::b, a::c::d, a::c::e.
      my $expand; $expand = sub {
        my ($base, $list) = @_;
        my ($depth, $cur) = (0, "");
        for my $ch (split //, "$list,") {
          if ($ch eq "," && $depth == 0) {
            $cur =~ s/^\s+|\s+$//g;
            if ($cur =~ /^([\w:]*?)::\{(.*)\}$/s) { $expand->("$base$1::", $2) }
            elsif ($cur ne "") { push @paths, "$base$cur" }
            $cur = "";
          } else { $depth++ if $ch eq "{"; $depth-- if $ch eq "}"; $cur .= $ch }
        }
      };
      while ($src =~ /\buse\s+((?:crate|super)(?:::\w+)*)::\{(.*?)\};/sg) { $expand->("$1::", $2) }
      push @paths, $1 while $src =~ /\b((?:crate|super)(?:::\w+)+)/g;
      my %to;
      for my $p (@paths) {
        my @seg = split /::/, $p;
        my $first = shift @seg;
        my $at;
        if ($first eq "crate") {
          next unless $prefix eq "" || (@seg && $seg[0] eq $prefix && shift @seg);
          $at = "";
        } else { $at = $parent; while (@seg && $seg[0] eq "super") { shift @seg; $at = $up } }
        while (@seg) {
          my $next = $at eq "" ? $seg[0] : "$at/$seg[0]";
          last unless exists $mod{$next};
          $at = $next; shift @seg;
        }
        $at = $handed{$at}{$seg[0]} if @seg && exists $handed{$at} && exists $handed{$at}{$seg[0]};
        next unless exists $mod{$at};
        $to{$mod{$at}} = 1 unless $mod{$at} eq $f;
      }
      print "$f $_\n" for sort keys %to;
    }' "$@"
}
check_circles() { # name root prefix
  local edges loops
  edges=$(graph "$2" "$3")
  # A face (a folder's mod.rs) reached from below is the folder itself: only its own
  # definitions tie it, and those a child may use, as every file uses its folder'"'"'s type.
  loops=$(tsort <<<"$edges" 2>&1 >/dev/null | grep -v '^tsort: -: input contains a loop:' || true)
  if [ -n "$loops" ]; then
    echo "parts: $1 has a circle of imports through:" >&2
    sed 's/^tsort: /  /' <<<"$loops" >&2
    fail=1
  fi
  echo "$1: $(wc -l <<<"$edges") imports among $(find "$2" -name '*.rs' | wc -l) files"
}
for src in crates/*/src; do
  check_circles "$(basename "$(dirname "$src")")" "$src" ""
done
exit $fail
