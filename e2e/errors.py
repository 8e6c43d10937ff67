"""One user-facing error type; cli.main turns it into a one-line message and exit status 2."""


class UserError(Exception):
    """Bad input or an unusable environment: the message is shown to the user as one line."""

    exit_code = 2
