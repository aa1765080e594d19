DROP FUNCTION inbox_complete_keyed(bigint[], uuid, text, bigint, boolean);
DROP FUNCTION inbox_lease_held(bigint, integer);
