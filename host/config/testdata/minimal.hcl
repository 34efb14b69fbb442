# Everything omitted: every default applies.
