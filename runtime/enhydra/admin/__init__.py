"""Operations on a whole application from outside it (reset)."""
