-- A transform plugin's drop is one dead-letter reason, `dropped`, whatever the plugin
-- said; its words stay in the delivery's last error.
UPDATE deliveries SET last_error = COALESCE(last_error, substr(reason, 9)), reason = 'dropped'
WHERE state = 'dead' AND reason LIKE 'dropped:%';
