# Real panels with known subject groups from R packages (bench_longitudinal.py::test_real_panels):
# each written to the folder given as the first argument as panel_<name>.csv with columns
# subject, time, the response, group. Debian: apt-get install r-cran-nlme r-cran-mass r-cran-geepack
args <- commandArgs(trailingOnly = TRUE)
setwd(args[1])
suppressMessages({library(nlme); library(MASS); library(geepack)})
w <- function(df, name) write.csv(df, paste0(name, ".csv"), row.names = FALSE)
d <- Sitka; w(data.frame(subject = d$tree, time = d$Time, size = d$size, group = d$treat), "panel_sitka")
data(dietox); d <- dietox; w(data.frame(subject = d$Pig, time = d$Time, weight = d$Weight, group = d$Cu), "panel_dietox")
d <- as.data.frame(Dialyzer)
w(data.frame(subject = as.character(d$Subject), time = d$pressure, rate = d$rate, group = d$QB), "panel_dialyzer")
