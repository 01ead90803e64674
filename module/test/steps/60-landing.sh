# O_DIRECT and io_uring reads from NVMe into device pages; the host
# verifies the PHXFS-LANDED ranges in the BAR's backing file afterwards.
/bin/vmcheck run /mnt/pattern.bin /mnt/scratch
