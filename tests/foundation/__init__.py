"""Configuration (``streamrec.foundation.config``): loading, precedence, and refusing bad values."""
