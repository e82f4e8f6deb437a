"""Every unknown flag of a command line, reported at once, each explained.

absl stops at the first unknown flag and suggests the nearest defined name,
which for tf-slim's names is often an unrelated flag (`--num_clones`: "Did
you mean num_classes", a flag that changes the model). `problem` scans the
whole command line as absl parses it (`--name=value`, `--name value`,
`--noname`, `--` ends the flags) before absl does, and names each unknown
flag with what to give instead: tf-slim's names and former names from
cli/flags/slim_names.py, another script's flag, else the nearest defined
flag when one is close.
"""

from __future__ import annotations

import difflib
import os
from typing import List, Optional, Sequence

from absl import flags

from cli.flags import grouped_help
from cli.flags import slim_names

OWN_FLAGS = frozenset(name for _, names in grouped_help.GROUPS
                      for name in names)  # every script's flags.


def _takes_next(arg: str, flag: flags.Flag) -> bool:
  """Whether absl reads the next argument as `arg`'s value."""
  return not flag.boolean and "=" not in arg


def unknown_names(args: Sequence[str],
                  flag_values: flags.FlagValues) -> List[str]:
  """The names of the flags in `args` (argv[1:]) `flag_values` lacks (but
  those `--undefok` names)."""
  found, allowed, rest = [], set(), iter(args)
  for arg in rest:
    if arg == "--":
      break
    name = arg.lstrip("-").split("=", 1)[0]
    if not arg.startswith("-") or not name:
      continue
    if name == "undefok":
      value = arg.split("=", 1)[1] if "=" in arg else next(rest, "")
      allowed.update(item.strip() for item in value.split(","))
    elif name in flag_values:
      if _takes_next(arg, flag_values[name]):
        next(rest, None)
    elif not (name.startswith("no") and name[2:] in flag_values and
              flag_values[name[2:]].boolean):
      found.append(name)
  return [name for name in found if name not in allowed and not (
      name.startswith("no") and name[2:] in allowed)]


def explain(name: str, flag_values: flags.FlagValues, script: str) -> str:
  """`--name`, what it is and what to give instead, for one unknown flag."""
  known = slim_names.equivalent(name, OWN_FLAGS)
  if known:
    return known
  if name in OWN_FLAGS:
    return f"--{name} is another script's flag, not {script}'s"
  close = difflib.get_close_matches(name, list(flag_values), n=1,
                                    cutoff=0.8)
  hint = f" (did you mean --{close[0]}?)" if close else ""
  return f"--{name} is no flag of {script}{hint}"


def problem(argv: Sequence[str],
            flag_values: flags.FlagValues = flags.FLAGS) -> Optional[str]:
  """One line naming every unknown flag of `argv` and the fix; None when
  every flag is known."""
  try:
    args = flag_values.read_flags_from_files(list(argv[1:]), force_gnu=False)
  except flags.Error:
    return None  # absl's parse names the --flagfile problem.
  names = list(dict.fromkeys(unknown_names(args, flag_values)))
  if not names:
    return None
  script = os.path.basename(argv[0]) if argv else "the script"
  parts = "; ".join(explain(name, flag_values, script) for name in names)
  return (f"unknown flag{'s' if len(names) > 1 else ''}: {parts}. Rename "
          f"or drop {'them' if len(names) > 1 else 'it'} (python {script} "
          "--help lists the flags).")
