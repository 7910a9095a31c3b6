"""The one error type for user mistakes; the CLI catches it once and prints its one line."""


class UserError(Exception):
    """A problem the user can fix (a bad manifest, flag, file or sample); printed as one line."""
