ALTER FUNCTION inbox_release_key() RESET enable_seqscan;
