"""Errors unirank raises for bad configuration.

Every message is one line: what is wrong (the variable and its value) and a hint saying what to do.
"""

from __future__ import annotations

__all__ = ["ConfigError"]


class ConfigError(ValueError):
    """A launcher's environment (or a user's argument) is missing, malformed or inconsistent.

    ``variable`` names the environment variable or option at fault (may be ``None``),
    ``value`` its value as seen, and ``hint`` what the user can do about it; ``exit_code``
    the command's exit code for it where not :data:`unirank.exitcodes.USAGE` (None).
    """

    def __init__(
        self,
        message: str,
        *,
        variable: str | None = None,
        value: str | None = None,
        hint: str | None = None,
        exit_code: int | None = None,
    ) -> None:
        self.message = message
        self.exit_code = exit_code
        self.variable = variable
        self.value = value
        self.hint = hint
        parts = []
        if variable is not None:
            shown = "<unset>" if value is None else repr(value)
            parts.append(f"{variable}={shown}: {message}")
        else:
            parts.append(message)
        if hint:
            parts.append(f"HINT: {hint}")
        super().__init__(" ".join(" ".join(parts).split()))

    def renamed(self, names: dict[str, str]) -> ConfigError:
        """This error with its variable spelled as ``names`` says (an API argument's name as
        the command-line option a user typed), or itself when ``names`` has no entry."""
        if self.variable not in names:
            return self
        return ConfigError(self.message, variable=names[self.variable], value=self.value,
                           hint=self.hint, exit_code=self.exit_code)
