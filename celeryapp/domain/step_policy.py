"""What a step may run: which tasks, which programs, which environment variables, which databases.

Anyone who can publish to the broker can apply a definition, so a definition is untrusted input
and these rules are the operator's: they come from the settings of the process that checks them.
They are checked when a definition is validated and again by the worker about to run the step,
whose own settings win (a definition stored under a looser policy must not run).

Every check returns the reason it refuses, or ``None`` when it allows.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase

from celeryapp.config import Settings
from celeryapp.domain.definition import StepKind
from celeryapp.variables import OWN_VARIABLES

#: Environment variable names (executable ``env`` keys, a sql step's ``database_env``).
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: Task names no step may run, whatever ``CHORDBEAT_STEP_TASKS`` says: Celery's built-ins
#: (``celery.starmap`` and friends call any task by name) and chordbeat's own control and
#: service tasks. The executable and sql tasks are reached through their ``kind`` only.
RESERVED_TASK_PREFIXES = ("celery.", "chordbeat.")
#: chordbeat's tasks that are ordinary steps (demos and tests).
STEP_TASK_EXCEPTIONS = ("chordbeat.examples.",)
#: Variables an executable step's ``env`` may not set: they make the dynamic loader, a shell or
#: an interpreter load or run code of the caller's choosing before or inside the program.
#: Includes glibc's list of variables it strips for setuid programs (unsecvars.h).
DENIED_ENV_NAMES = frozenset(
    {
        "PATH",
        "IFS",
        "ENV",
        "BASH_ENV",
        "SHELLOPTS",
        "BASHOPTS",
        "PS4",
        "PROMPT_COMMAND",
        "CDPATH",
        "GLOBIGNORE",
        "GCONV_PATH",
        "GETCONF_DIR",
        "GLIBC_TUNABLES",
        "HOSTALIASES",
        "LOCALDOMAIN",
        "LOCPATH",
        "NIS_PATH",
        "NLSPATH",
        "RESOLV_HOST_CONF",
        "RES_OPTIONS",
        "TMPDIR",
        "TZDIR",
        "PERLLIB",
        "CLASSPATH",
        "JAVA_TOOL_OPTIONS",
        "_JAVA_OPTIONS",
        "JDK_JAVA_OPTIONS",
        "TCLLIBPATH",
        "OPENSSL_CONF",
        "OPENSSL_ENGINES",
        "OPENSSL_MODULES",
        # Start-up files of shells, editors and interpreters (each names a file of code).
        "ZDOTDIR",
        "XDG_CONFIG_HOME",
        "XDG_CONFIG_DIRS",
        "INPUTRC",
        "VIMINIT",
        "EXINIT",
        "MYVIMRC",
        "GVIMINIT",
        "EMACSLOADPATH",
        "PHPRC",
        "PHP_INI_SCAN_DIR",
        "R_PROFILE",
        "R_PROFILE_USER",
        "R_ENVIRON",
        "R_ENVIRON_USER",
        "R_LIBS",
        "R_LIBS_USER",
        "BUNDLE_GEMFILE",
        "CURL_HOME",
        "WGETRC",
        "KRB5_CONFIG",
    }
)
#: Prefixes of denied variables: the loader (LD_*, DYLD_*), malloc debugging, interpreters'
#: module paths and start-up options, git's command hooks, bash's exported functions.
DENIED_ENV_PREFIXES = (
    "LD_",
    "DYLD_",
    "MALLOC_",
    "PYTHON",
    "PERL5",
    "RUBY",
    "GEM_",
    "NODE_",
    "NPM_CONFIG_",
    "PIP_",
    "LUA_",
    "GUILE_",
    "JULIA_",
    "GIT_",
    "BASH_FUNC_",
)
#: Variables whose value is a command other programs run for their own purposes: a password
#: prompt, a pager, an editor, a browser, a shell, less's input filters.
COMMAND_ENV_NAMES = frozenset(
    {
        "SSH_ASKPASS",
        "SSH_ASKPASS_REQUIRE",
        "SUDO_ASKPASS",
        "PAGER",
        "MANPAGER",
        "SYSTEMD_PAGER",
        "EDITOR",
        "VISUAL",
        "SUDO_EDITOR",
        "SYSTEMD_EDITOR",
        "FCEDIT",
        "BROWSER",
        "SHELL",
        "LESSOPEN",
        "LESSCLOSE",
        "RSYNC_RSH",
        "RSYNC_CONNECT_PROG",
    }
)
#: Variables that send a program's network traffic through, or make it trust, a party of the
#: caller's choosing: proxies (curl and most libraries read them in lower case too) and
#: certificate authorities.
NETWORK_ENV_NAMES = frozenset(
    {
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "FTP_PROXY",
        "ALL_PROXY",
        "NO_PROXY",
        "SOCKS_PROXY",
        "SOCKS5_SERVER",
        "RSYNC_PROXY",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "CURL_CA_BUNDLE",
        "REQUESTS_CA_BUNDLE",
    }
)
#: Namespaces of the worker's own secrets, never a sql step's database.
SECRET_ENV_PREFIXES = ("FLOWER_",)


def step_task_refusal(task: str, patterns: Sequence[str]) -> str | None:
    """Whether a task may be a step: never a reserved one, and one matching ``patterns``."""
    if task.startswith(RESERVED_TASK_PREFIXES) and not task.startswith(STEP_TASK_EXCEPTIONS):
        owner = "Celery's" if task.startswith("celery.") else "chordbeat's"
        return f"task {task!r} is one of {owner} own tasks, which are never steps"
    if not any(fnmatchcase(task, pattern) for pattern in patterns):
        return f"task {task!r} is not allowed as a step here (CHORDBEAT_STEP_TASKS: {','.join(patterns)})"
    return None


def program_refusal(program: str) -> str | None:
    """What any program must be, whatever the allowlist: an absolute path."""
    if "\0" in program:
        return "the program must not contain NUL characters"
    if not os.path.isabs(program):
        return f"the program {program!r} must be an absolute path"
    return None


def executable_refusal(
    program: str, allow: Sequence[str], *, resolve: Callable[[str], str] = os.path.realpath
) -> str | None:
    """Whether ``program`` is on the operator's allowlist once symlinks and ``..`` are resolved.

    An entry ending in ``/`` allows everything below that directory; any other entry allows
    that one file. Entries are resolved too, so ``/bin/sh`` still matches where ``/bin`` is a
    link to ``/usr/bin``. An empty allowlist allows nothing.
    """
    refusal = program_refusal(program)
    if refusal:
        return refusal
    return resolved_program_refusal(resolve(program), program, allow, resolve=resolve)


def resolved_program_refusal(
    real: str, program: str, allow: Sequence[str], *, resolve: Callable[[str], str] = os.path.realpath
) -> str | None:
    """Whether ``real``, the path ``program`` was resolved to, is on the allowlist; the refusal
    names ``program`` as the caller wrote it."""
    for entry in allow:
        if entry.endswith("/"):
            directory = resolve(entry).rstrip("/") + "/"
            if real.startswith(directory):
                return None
        elif real == resolve(entry):
            return None
    # The resolved path is not shown: it would let a caller map the worker's file system.
    return f"the program {program} is not in CHORDBEAT_EXECUTABLE_ALLOW (compared once symlinks and '..' are resolved)"


def env_name_refusal(name: str) -> str | None:
    """Whether an executable step's ``env`` may set ``name``."""
    if not ENV_NAME.fullmatch(name):
        return f"{name!r} is not an environment variable name"
    # Compared in any letter case: the names are case-sensitive to the kernel, but programs read
    # some in lower case (http_proxy before HTTP_PROXY in curl) and a denylist is no place to
    # bet which. ENV_NAME admits ASCII only, so no Unicode look-alike reaches this comparison.
    upper = name.upper()
    if upper in DENIED_ENV_NAMES or upper.startswith(DENIED_ENV_PREFIXES):
        return f"{name} may not be set: it changes how programs are loaded or run"
    if upper in COMMAND_ENV_NAMES:
        return f"{name} may not be set: programs run the command it names"
    if upper in NETWORK_ENV_NAMES:
        return f"{name} may not be set: it changes where programs connect or whom they trust"
    return None


def sql_env_refusal(name: str, prefix: str | None) -> str | None:
    """Whether a sql step may read its database URL from ``$name``.

    Only variables under the operator's ``prefix`` qualify; the worker's own settings and
    Flower's are refused by name whatever the prefix. ``prefix=None`` checks only the latter.
    """
    if not ENV_NAME.fullmatch(name):
        return "must name an environment variable holding the URL"
    if name in OWN_VARIABLES or name.upper().startswith(SECRET_ENV_PREFIXES):
        return f"{name} is one of the worker's own settings, never a sql step's database"
    if prefix is not None and (not name.startswith(prefix) or name == prefix):
        return f"{name} does not start with {prefix} (CHORDBEAT_SQL_ENV_PREFIX)"
    return None


def _every_task(task: str) -> bool:
    return True


@dataclass(frozen=True)
class StepRules:
    """What one process lets a step run: the operator's policy and the tasks it has registered."""

    #: Whether a task is registered in this process.
    registered: Callable[[str], bool]
    #: Patterns of the tasks a step may run (``CHORDBEAT_STEP_TASKS``).
    step_tasks: tuple[str, ...]
    #: The step kinds enabled (``CHORDBEAT_STEP_KINDS``).
    step_kinds: frozenset[str]
    #: Programs, and directories ending in ``/``, executable steps may run (``CHORDBEAT_EXECUTABLE_ALLOW``).
    executable_allow: tuple[str, ...]
    #: What a sql step's ``database_env`` starts with (``CHORDBEAT_SQL_ENV_PREFIX``); ``None``: any
    #: variable but the worker's own.
    sql_env_prefix: str | None
    #: Whose tasks ``registered`` knows, as the refusal of an unregistered task says it.
    registry: str = "in the worker"
    #: The rules for a step on a given queue (``None``: the default step queue) when they depend
    #: on it: those of the workers that consume it. ``None``: the same rules on every queue.
    per_queue: Callable[[str | None], StepRules] | None = None

    @classmethod
    def of(cls, settings: Settings, registered: Callable[[str], bool]) -> StepRules:
        """The rules of a process with these settings and tasks."""
        return cls(
            registered,
            step_tasks=settings.step_tasks,
            step_kinds=settings.step_kinds,
            executable_allow=settings.executable_allow,
            sql_env_prefix=settings.sql_env_prefix,
        )

    @classmethod
    def without_policy(cls, registered: Callable[[str], bool] = _every_task) -> StepRules:
        """Only the rules that hold whatever the settings (no reserved task, an absolute program,
        not the worker's own variables) and, if given, which tasks are registered: for checking a
        definition away from the workers whose settings would apply."""
        # "/" allows every absolute path: what program_refusal alone allows.
        return cls(
            registered, step_tasks=("*",), step_kinds=frozenset(StepKind), executable_allow=("/",), sql_env_prefix=None
        )

    def on_queue(self, queue: str | None) -> StepRules:
        """The rules for a step on ``queue``."""
        return self if self.per_queue is None else self.per_queue(queue)

    def kind_refusal(self, kind: StepKind) -> str | None:
        if kind not in self.step_kinds:
            return f"{kind} steps are not enabled on the workers (CHORDBEAT_STEP_KINDS)"
        return None

    def task_refusal(self, task: str) -> str | None:
        refusal = step_task_refusal(task, self.step_tasks)
        if refusal is None and not self.registered(task):
            return f"task {task!r} is not registered {self.registry}"
        return refusal

    def spec_refusal(self, kind: StepKind, task: str) -> str | None:
        """Whether a step of ``kind`` running ``task`` may run here at all."""
        if kind is StepKind.TASK:
            return self.task_refusal(task)
        refusal = self.kind_refusal(kind)
        if refusal is None and not self.registered(task):
            return f"task {task!r} is not registered {self.registry}"
        return refusal

    def executable_refusal(self, program: str) -> str | None:
        return executable_refusal(program, self.executable_allow)

    def sql_env_refusal(self, name: str) -> str | None:
        return sql_env_refusal(name, self.sql_env_prefix)
