DROP TABLE demo_ledger;
