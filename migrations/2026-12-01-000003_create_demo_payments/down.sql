DROP TABLE demo_payments;
